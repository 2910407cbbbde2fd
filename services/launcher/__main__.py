from services.launcher.service import main

main()
