"""Schedulers reproduced from the seed papers (001 MC-SF, 002 BROS, 003 hybrid offline-online,
004 LAMPS), each checked against the small cases in docs/seeds-*.md."""
