"""Reports: console, JSON, CSV, HTML, JUnit, Markdown. Renders plain result dicts;
never imports torch."""
