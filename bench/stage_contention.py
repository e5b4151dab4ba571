"""Staging a batch under GIL contention: ``EncodeStage.stage`` (torch.stack, which copies with the GIL
released) against the np.stack it replaced, alone and beside a Python thread that wants the GIL (as the
encoder thread launching kernels does), switch interval 0.1 ms as in a GPU build. 64 frames of
256x256x3 uint8, 40 batches per timing, 5 interleaved repeats, medians.

    PYTHONPATH=src python3 bench/stage_contention.py
"""
import statistics, sys, threading, time, types
import numpy as np, torch
from shardsmith.encode.stage import EncodeStage
sys.setswitchinterval(0.0001)
torch.set_num_threads(1)
frames = [np.random.randint(0, 255, (1, 256, 256, 3), dtype=np.uint8) for _ in range(64)]
st = EncodeStage.__new__(EncodeStage)  # only what stage() reads
st.device, st.batch_size, st.seconds = "cpu", 64, {"prepare": 0.0}

def new():
    return EncodeStage.stage(st, frames)

def old():
    return torch.from_numpy(np.stack(frames))

assert torch.equal(new(), old())
res = {}
for rep in range(5):
    for fn in (old, new):
        for contended in (False, True):
            stop, count = [False], [0]
            def spin():
                while not stop[0]:
                    count[0] += 1
            th = threading.Thread(target=spin) if contended else None
            if th: th.start(); time.sleep(0.02)
            t = time.perf_counter()
            for _ in range(40): fn()
            dt = (time.perf_counter() - t) / 40
            stop[0] = True
            if th: th.join()
            res.setdefault((fn.__name__, contended), []).append(dt)
for k, v in sorted(res.items()):
    print(k, f"median {statistics.median(v)*1e3:.2f} ms per batch of 64 x 256x256x3")
print("contended old/new:", statistics.median(res[("old", True)]) / statistics.median(res[("new", True)]))
print("alone old/new:", statistics.median(res[("old", False)]) / statistics.median(res[("new", False)]))

# the rest of a batch's main-thread work, same conditions, for 64 [4,32,32] bf16 latents: before, a
# tensor per item (``EncodeStage._complete``: one clone each), then its latent.pth and json (the member
# code of before); now, every latent.pth rendered straight from the batch (``pt_bytes_rows``) and the
# json (``LatentMembers._wds_members``)
import types  # noqa: E402

from shardsmith.recipe import LatentWdsOutput  # noqa: E402
from shardsmith.records import PlannedItem, SampleResult  # noqa: E402
from shardsmith.sinks.latent_members import LatentMembers  # noqa: E402
from shardsmith.sinks.pt_write import pt_bytes_fast, pt_bytes_rows  # noqa: E402

z = torch.randn(64, 4, 32, 32).to(torch.bfloat16)
fin = LatentMembers.__new__(LatentMembers)
fin.o, fin.multi = LatentWdsOutput(format="latent_wds", latent_dtype="bfloat16"), False
fin.sources = [types.SimpleNamespace(name="p", license=None, origin=None)]
fin.models = {"vae": {"family": "sd", "weights": "random-weights", "path_or_repo": None}}
items = [PlannedItem(idx=i, item_id=f"p/img{i}.jpg", key=f"p/img{i}", source=0, path=f"/x/{i}.jpg",
                     relpath=f"img{i}.jpg", caption=None, label=None, label_name=None, meta={}, sha256="ab" * 32,
                     size_bytes=1, kind="image", width=256, height=256, image_format="JPEG", mode="RGB",
                     split="train", plan_status="ok") for i in range(64)]
ress = [SampleResult(idx=i, status="written", info={"bucket": "256x256x1", "crop": [0, 0, 256, 256], "fps": 1.0})
        for i in range(64)]


def per_item():  # before
    lat = [t.clone() for t in z.unbind(0)]
    for i in range(64):
        member = pt_bytes_fast(lat[i].to(torch.bfloat16).contiguous())
        fin._wds_members(items[i], ress[i], member, tuple(lat[i].shape), None)


def batched():  # now
    zb = z.to(torch.bfloat16).contiguous()
    rows = pt_bytes_rows(zb)
    for i in range(64):
        fin._wds_members(items[i], ress[i], rows[i], tuple(zb.shape[1:]), None)


r = {}
for rep in range(5):
    for fn in ((per_item, batched) if rep % 2 == 0 else (batched, per_item)):
        for contended in (False, True):
            stop = [False]

            def spin():
                while not stop[0]:
                    pass
            th = threading.Thread(target=spin) if contended else None
            if th:
                th.start()
                time.sleep(0.02)
            t = time.perf_counter()
            for _ in range(10):
                fn()
            r.setdefault((fn.__name__, contended), []).append((time.perf_counter() - t) / 10)
            stop[0] = True
            if th:
                th.join()
for k, v in sorted(r.items()):
    print("latents to members", k, f"median {statistics.median(v) * 1e3:.2f} ms per batch of 64")
print("latents to members, contended per_item/batched:",
      statistics.median(r[("per_item", True)]) / statistics.median(r[("batched", True)]))
print("latents to members, alone per_item/batched:",
      statistics.median(r[("per_item", False)]) / statistics.median(r[("batched", False)]))
