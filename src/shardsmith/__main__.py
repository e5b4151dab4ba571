from shardsmith.cli import app

app()
