"""Roles (plain classes that do not know where they run) and the runtimes that place them (local | ray)."""
