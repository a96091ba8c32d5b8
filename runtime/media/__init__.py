"""Media inside the runtime: references to stored files (``MediaRef``), image parts for
vision models, document text, voice transcription and ``MEDIA:`` lines in replies
(issue 12). The bytes live in the workspace ``inbox/``; transcripts hold references only.
"""
