"""File formats that several layers read and write (the perfRunner tuning DB, …).

A leaf package: its modules import only the leaves (errors, textinput, …), so tuners/ and
history/ can both use them without an import running up a layer.
"""
