"""Arrow Flight SQL on the Data Gateway, so standard clients (the ADBC Flight SQL driver, the
Flight SQL JDBC driver and the BI tools on top of them) query the speed layer.

`messages` decodes and encodes Flight SQL's protobuf commands, `auth` turns a Handshake with
basic credentials into bearer session tokens, `statements` finds the datasets a statement reads,
`held` keeps prepared statements, pending results and answers started ahead, `parameters` binds
a prepared statement's parameters, `catalog` builds the metadata results, `column_metadata`
describes result columns as Flight SQL clients read them, `status` turns errors into standard
statuses without tracebacks, and `service` answers the Flight calls.
The gateway's native protocol (JSON tickets, `speedlayer.protocol.query`) is unchanged.
"""
