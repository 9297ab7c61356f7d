"""edge-chat's screens: loading, the chat itself, settings, and the saved-chat list."""
