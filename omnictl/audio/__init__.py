"""Audio streams as a listener hears them: the playback clock and the deadline policy."""
