"""The Gradio UI: the layout (`ui`), one module of handlers per tab (`tabs/`), what they share
(`common`), example prompts."""
