"""Statement and ledger formats people have: camt.053, MT940, OFX/QFX and Beancount, each read by a library.

Each kind is a `StatementSource` (formats/base.py), listed in
sources.SOURCE_KINDS under its schedule `type` (camt053, mt940, ofx,
beancount). It reads a file's movements (`rows = "entries"`, the default) or
its stated balances (`rows = "balances"`), which the balance check uses.
"""
