from trainguard.dataflows.cli import main

main()
