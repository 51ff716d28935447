"""Stage boundaries: parameters in, files out (atomically). Each `viasd` subcommand calls one; the
Snakemake rules and DVC stages call the subcommands."""
