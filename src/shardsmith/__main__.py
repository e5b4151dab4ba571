from shardsmith.cli import main

main()
