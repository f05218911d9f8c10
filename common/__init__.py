"""What every layer shares: errors meant for people, files written whole, locks, output that may
close."""
