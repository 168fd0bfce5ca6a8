"""One module per tab: its handlers turn the page's values into runs (`decoding`) and views
(`visualize`)."""
