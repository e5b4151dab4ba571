from shardsmith.cli import app

app(prog_name="shardsmith")
