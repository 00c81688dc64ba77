"""The meshpilot command and its subcommands."""
