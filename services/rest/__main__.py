from services.rest.service import main

main()
