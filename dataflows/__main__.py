from dataflows.cli import main

main()
