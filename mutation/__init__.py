"""Mutation testing of the engine's backward code: does a broken backward fail the suite?

`python -m mutation --help` says how to run it; mutants.py lists the kinds of mutant,
targets.py what is mutated and which tests run, run.py the copies and the report.
"""
