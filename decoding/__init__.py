"""SpecLens's engine: models, drafts, verification, the speculative loop and its Trace.

No UI code lives here: `decoding` never imports gradio or plotly.
"""
