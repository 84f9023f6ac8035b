from data.cli import main

main()
