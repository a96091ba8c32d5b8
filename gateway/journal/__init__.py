"""The write-ahead intake journal: accepted platform messages survive crashes and shutdowns
(store: the file; tracking: the marks along a message's path; resume: what happens to
unfinished entries at start and at shutdown; outcomes: the one outcome of every accepted
message, kept as its entry's done record; recorder: who records it; dead_letters:
messages set aside after the process died on them 3 times the same way)."""
