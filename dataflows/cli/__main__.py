from trainguard.cli.app import main

main()
