"""The files here are bench plugins that tests load (``posenc bench --plugin``); pytest
does not import them itself: importing one registers its tasks and schemes."""

collect_ignore_glob = ["*.py"]
