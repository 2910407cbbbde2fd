from services.runtime.service import main

main()
