"""tools.bench: training and sampling speed, memory and MFU for a config (`python -m tools.bench`,
whose options __main__.py gives). training.py times the real train step and its memory, decoding.py
each decoding path against the memory-bandwidth floor, attention.py attention alone against T."""
