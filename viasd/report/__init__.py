"""The study report (`viasd report`): the tables (`tables`), the oracle comparison (`headroom`) and the
plots (`plots`) of every pair and task."""
