"""Helpers every part of gwdet's run infrastructure uses, below all of it (they import nothing of
gwdet but :mod:`gwdet.errors` and each other):

* :mod:`gwdet.utils.atomic`: files written under a temporary name and renamed into place, with
  their SHA-256 recorded beside them (``<file>.sha256``) where gwdet reads them again;
* :mod:`gwdet.utils.cli_errors`: the tools' one-line errors (``<tool>: error: <message>``, exit
  status 2; ``--verbose`` shows the traceback) and the check of an output flag;
* :mod:`gwdet.utils.command_line`: the command-line reading every tool shares (a flag given twice
  refused, flags read wherever they stand among the overrides);
* :mod:`gwdet.utils.run_file_names`: the names of the files and folders a run leaves in its
  ``OUTPUT_DIR``;
* :mod:`gwdet.utils.fingerprints`: a few bytes that tell files' contents apart.
"""
