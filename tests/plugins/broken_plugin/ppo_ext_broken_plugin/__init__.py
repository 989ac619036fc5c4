"""Test fixture: entry points that fail to import or break their protocol."""
