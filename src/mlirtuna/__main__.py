from mlirtuna.cli import main

main()
