"""Audio streams as a listener hears them: the playback clock, the deadline policy that
chooses which stream a stage serves next, and admission by predicted underrun. (The tools
for the samples themselves are :mod:`omnictl.audio`.)"""
