"""The write-ahead intake journal: accepted platform messages survive crashes and shutdowns
(store: the file; tracking: the marks along a message's path; resume: what happens to
unfinished entries at start and at shutdown)."""
