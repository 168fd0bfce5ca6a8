"""The Gradio UI: layout (`ui`), event handlers (`handlers`), example prompts."""
