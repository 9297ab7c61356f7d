"""Fuzz targets (hypothesis): GGUF headers and metadata, edge-serve's request bodies and JSON schemas, the chats
folder's files, chat templates. Each property is "a result or edge's own one-line error, within a time limit".

The test suite runs each target briefly, on the same examples every time; `python -m tests.fuzz` runs each for a
minute or longer on fresh random examples (tests/fuzz/__main__.py, docs/layout.md).
"""
