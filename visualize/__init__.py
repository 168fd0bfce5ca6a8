"""Pure functions from a Trace (or a DataFrame) to HTML and Plotly figures.

Never imports torch or transformers: a saved trace can be replayed and
charted on a machine with no model at all.
"""
