"""A held-out set for the speech recognizer: questions and voices no setting was tuned on.

``benchmarks/answer_quality.py`` chose Whisper's decoding settings on the questions of
:mod:`.quality` in three ``espeak-ng`` voices and the Piper voice. To see whether a
setting generalizes, ``benchmarks/asr_heldout.py`` asks *other* questions (each with
known answers) in *other* ``espeak-ng`` voices, accents, speeds and pitches, plus the
Piper voice; the audio is made at run time by :class:`.quality.SpeechMaker` (never
committed). None of these questions is in :data:`.quality.QUESTIONS`.
"""

from __future__ import annotations

from benchmarks.eval.quality import Question, Voice

HELDOUT_QUESTIONS: tuple[Question, ...] = (
    Question("What is the capital of Portugal?", ("Lisbon",)),
    Question("How many legs does an insect have?", ("six", "6")),
    Question("What colour is a ripe tomato?", ("red",)),
    Question("What is the capital of Egypt?", ("Cairo",)),
    Question("How many seconds are in a minute?", ("sixty", "60")),
    Question("What is the opposite of wet?", ("dry",)),
    Question("Which planet is known as the red planet?", ("Mars",)),
    Question("What do caterpillars turn into?", ("butterfly", "butterflies", "moth", "moths")),
    Question("What is the capital of Greece?", ("Athens",)),
    Question("How many letters are in the English alphabet?", ("twenty-six", "twenty six", "26")),
    Question("What is the opposite of old?", ("young", "new")),
    Question("What colour do you get when you mix blue and yellow?", ("green",)),
    Question("What is the largest desert in the world?", ("Sahara", "Antarctic", "Antarctica")),
    Question("What is the capital of Australia?", ("Canberra",)),
    Question("How many players are on a soccer team?", ("eleven", "11")),
    Question("What do plants need from the sun to grow?", ("light", "sunlight", "energy")),
    Question("What is the capital of China?", ("Beijing",)),
    Question("What animal is known for having a very long neck?", ("giraffe", "giraffes")),
    Question("How many days are in a leap year?", ("three hundred sixty-six", "366")),
    Question("What is the opposite of fast?", ("slow",)),
    Question("What is the tallest mountain in the world?", ("Everest", "Mount Everest")),
    Question("Which bird is a symbol of peace?", ("dove", "doves", "pigeon")),
    Question("What is the capital of Ireland?", ("Dublin",)),
    Question("What is three times three?", ("nine", "9")),
    Question("Which ocean lies between Europe and America?", ("Atlantic",)),
    Question("What is the main language spoken in Brazil?", ("Portuguese",)),
    Question("What is the hardest natural substance?", ("diamond", "diamonds")),
    Question("How many strings does a standard guitar have?", ("six", "6")),
    Question("What is the capital of Mexico?", ("Mexico City",)),
    Question("Which metal is liquid at room temperature?", ("mercury",)),
    Question("What do you call a baby cat?", ("kitten", "kittens")),
    Question("What is the longest river in Africa?", ("Nile",)),
)

# Voices, accents, speeds and pitches none of the tuning runs used, and the Piper voice.
HELDOUT_VOICES: tuple[Voice, ...] = (
    Voice("espeak en-gb-scotland 160wpm p45", "espeak-ng", "en-gb-scotland", 160, 45),
    Voice("espeak en-029 145wpm p55", "espeak-ng", "en-029", 145, 55),
    Voice("espeak en-us-nyc+m3 185wpm p40", "espeak-ng", "en-us-nyc+m3", 185, 40),
    Voice("espeak en-gb-x-rp+f2 170wpm p65", "espeak-ng", "en-gb-x-rp+f2", 170, 65),
    Voice("espeak en-us 130wpm p30", "espeak-ng", "en-us", 130, 30),
    Voice("piper joe", "piper"),
)
