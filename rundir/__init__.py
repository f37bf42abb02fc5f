"""The run directory that train.py writes and everything else reads, owned in one place: its file
names, lock, trainer state, metrics, record and loading (README's layout table says which is where).
Nothing is imported here, so a reader that needs only a file name loads nothing else."""
