"""The benchmark (`viasd bench`): our methods against `transformers`' generate and assisted generation,
timed side by side on one machine (`timing`), their outputs checked and scored (`outputs`), the figures and
tables derived from the timed rounds (`figures`), and the command on a pair and task of the study (`command`)."""
