"""edge-chat: the terminal chat. Today a streaming console chat; the Textual app follows (issue "Step 4 of 7")."""
