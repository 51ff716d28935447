"""The embedded default study's data: the Python standard library's own sources (docs/study.md)."""
