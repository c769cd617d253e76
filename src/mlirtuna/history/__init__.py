"""What comes out of the database: a session's winners (the one counting rule), export to
perfRunner's tuning DB and rocMLIR's .debug TSV, `import-tsv`, compare (old vs new, regressions
within or beyond noise), reuse of equivalent results, and quick-tuning lists.

It reads jobs, results and candidates through queue/, sessions and catalog; the tuning-DB file
format itself is formats/tuningdb.py. Modules are imported by name (`history.export`, …).
"""
