"""The processes a user starts, above every floor: one sweep (`python -m raybench.commands.sweep`, which
`raybench sweep` hands over to) and a benchmark of sweeps (`raybench benchmark`). They join the sweep floor,
which runs the protocol, to the report floor, which writes what it found."""
