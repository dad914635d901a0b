"""Shared plumbing: AWS clients, names, tags, resource records, component conventions."""
