"""Load the encoders and warm them up on a background thread while the build plans.

Planning reads every input once on the worker processes and leaves the main process mostly
waiting; loading the models, loading (or building) the compiled graph and cuDNN's autotuning of
the first batch shape would otherwise run after it, one after the other. ``ModelPreload``
overlaps them: ``start()`` right after the workers are forked (never before: a fork must not
copy a process whose other threads hold CUDA or allocator locks), ``raise_if_failed()`` while
planning (a model that cannot load stops the plan at once), ``planned()`` when the plan is done
(warm-up stops after the bucket shape it is on), ``result()`` joins and returns the
:class:`~shardsmith.encode.stage.EncodeStage`, re-raising any error of the load itself. ``cancel(wait)``
(the build failed before it took the stage): the thread stops after the step under way (a model's load
is not interrupted; a text pass stops at its next caption), warms nothing up, touches the ledger no more and
closes what it loaded; with
``wait``, returns once it has (a library caller's failed build leaves no thread behind that loads models or
opens the ledger, say while a later build forks its plan process: a child forked while another thread held
SQLite's allocator lock hangs).
``start()`` first says, on the caller's thread, that a hub repo id is not in the cache while ``HF_HUB_OFFLINE`` is
set (:func:`~shardsmith.precheck.check_hub_cache`): a build stops before its plan, not after the imports.
``with_offload(run)`` (a build's ``models.offload``, before ``start()``): the decision is made first on the
loading thread, and a ``text-first`` load runs the text pass once the plan is done.
"""

from __future__ import annotations

import threading
import time
from typing import Any


def warms_up(stage) -> bool:
    """Whether a build's stage warms up before its first batch: on a GPU (cuDNN's kernels, ``auto``'s decision),
    and wherever it compiles (``on``, or ``auto`` following a compiled decision kept by the build): the compile,
    and the decision to pad batches for packages, come before any batch is staged."""
    if stage.device == "cuda" or stage.compile_setting == "on":
        return True
    kept = stage.compile_record.kept() if getattr(stage, "compile_record", None) is not None else None
    return stage.compile_setting == "auto" and kept is not None and kept["compiled"]


class ModelPreload:
    def __init__(self, recipe, warm: bool | None = None, root=None):
        """``warm``: None (default) warms up on a GPU, or when ``models.compile`` is "on" (the
        compile then overlaps the plan); True always; False never. ``root``: the folder the build writes,
        whose ledger keeps ``models.compile``'s decision (made in the warm-up, beside the plan)."""
        self.recipe, self.warm, self.root = recipe, warm, root
        self.offload = None
        self._planned = threading.Event()
        self._cancelled = threading.Event()
        self._stage = None
        self._error: BaseException | None = None
        self.seconds: dict[str, float] = {}
        import torch

        # the caller's intra-op threads, for the loading thread and, through the stage it makes, the
        # device thread (see pin_intra_op_threads)
        self._threads = torch.get_num_threads()
        self._thread = threading.Thread(target=self._run, name="shardsmith-model-preload", daemon=True)

    def with_offload(self, run) -> "ModelPreload":
        """Before :meth:`start`: the build's :class:`~shardsmith.encode.offload.OffloadRun`. ``models.offload`` is
        then decided first, on the loading thread (``auto`` asks the GPU there, after the build's workers are
        forked), and a ``text-first`` load runs the text pass once the plan is done (:meth:`planned`, or the
        plan running ahead)."""
        self.offload = run
        if run.planned is None:
            run.planned = self._planned
        return self

    def start(self) -> "ModelPreload":
        """Start loading; first, on the caller's thread, offline (``HF_HUB_OFFLINE``) a hub repo id that is not in
        the Hugging Face cache is a :class:`~shardsmith.precheck.ModelLoadError` now, before the plan (and before
        ``models.offload``'s estimate imports the model libraries)."""
        from shardsmith.precheck import check_hub_cache

        check_hub_cache(self.recipe)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            from shardsmith.encode.host_threads import pin_intra_op_threads
            from shardsmith.encode.stage import EncodeStage

            pin_intra_op_threads(self._threads)
            t = time.perf_counter()
            if self._cancelled.is_set():
                return
            decision = self.offload.decide_for(self.recipe) if self.offload is not None else None
            if decision is not None and decision.mode == "text-first":
                stage = EncodeStage.from_recipe(self.recipe, offload=self.offload)
            else:
                stage = EncodeStage.from_recipe(self.recipe)
            if decision is not None and getattr(stage, "offload", None) is None:
                stage.offload = decision
            if self.root is not None:
                from shardsmith.encode.compile_record import compile_record

                stage.compile_record = compile_record(self.recipe, self.root)
            self.seconds["load"] = round(time.perf_counter() - t, 3)
            if self._cancelled.is_set():  # the build failed while the models loaded
                stage.close()
                return
            if self.warm or (self.warm is None and warms_up(stage)):
                stage.warm_up_for(self.recipe, stop=self._planned)
            self._stage = stage
        except BaseException as exc:  # noqa: BLE001 - handed to the caller by result()
            self._error = exc

    def cancel(self, wait: bool = True) -> None:
        """The build failed before taking the stage: stop (see the module); with ``wait``, join the thread."""
        self._cancelled.set()
        self._planned.set()
        if self.offload is not None:  # a text pass under way (models.offload text-first) stops at its next caption
            self.offload.cancelled.set()
        if wait and self._thread.is_alive():
            self._thread.join()
        if self._stage is not None and not self._thread.is_alive():  # (loaded and warmed before the cancel)
            self._stage.close()
            self._stage = None

    def raise_if_failed(self) -> None:
        """Raise the load's error now if it has failed (cheap: meant to be called per planned item),
        so a wrong model path or an impossible bucket stops a long plan in seconds."""
        if self._error is not None:
            raise self._error

    def planned(self) -> None:
        """The plan is done: warm no further bucket shapes than the one under way."""
        self._planned.set()

    def result(self, stop_warm_up: bool = True) -> Any:
        """The loaded stage (waits for the load and the warm-up under way); raises the load's error.
        ``stop_warm_up=False`` (the plan still runs ahead) lets the warm-up do every bucket shape."""
        if stop_warm_up:
            self._planned.set()
        t = time.perf_counter()
        self._thread.join()
        self.seconds["waited_after_plan"] = round(time.perf_counter() - t, 3)
        if self._error is not None:
            raise self._error
        return self._stage
