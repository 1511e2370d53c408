"""The command line: thin wrappers that call the library and map errors to exit codes."""
