-- The connection's clock and the file's change counter.
--
-- Named blocks of the SQLite backend; what their placeholders stand for is
-- said once, in conveyor.backends.sqlite.statements.

-- name: clock
-- Seconds since the epoch: SQLite's own clock unless a test injects one.
select coalesce(:now, (julianday('now') - 2440587.5) * 86400.0);

-- name: data_version
-- Changes whenever another connection commits to the file: the cross-process
-- wake-up signal (workers check it every few tens of milliseconds).
pragma data_version;
