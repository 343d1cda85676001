"""The default tuned tables (CSV data) and the script that generates them."""
