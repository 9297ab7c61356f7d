"""edge-chat: the terminal chat. The Textual app (app.py, screens/, widgets/) streams replies as Markdown beside live
speed and memory figures; the console chat (session.py) runs the same conversation line by line, and `--prompt` or a
pipe answers once. cli.py parses the command line, loader.py loads the model behind a loading screen, settings.py
holds the settings applied without reloading, history.py saves chats, provenance.py colours drafted and target
tokens, pacing.py decides how often a streaming reply is redrawn, and completion.py runs base models as text
completion."""
