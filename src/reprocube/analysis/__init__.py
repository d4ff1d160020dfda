"""The comparison engine: what differs between two runs, two receipts or two environments, and how
much. Pure functions of what was read (reprocube.untrusted checked it); no command, no child process."""
