-- Releases of schedules, so that an older release of an app never reverts
-- a newer one's schedules during a rolling deploy. A release is an app's
-- set of schedule definitions, named by a digest of every schedule's name
-- and fingerprint and of the app's task names (every process of one build
-- computes the same). One row per release ever synced (a few bytes per
-- deploy; never pruned, since a release that came back after its row went
-- would count as the newest):
--
-- - generation: given at the release's first sync, greater than every
--   earlier release's; it orders releases by their first sync, not by
--   any process's clock.
-- - tasks: the app's task names; two releases that share one are releases
--   of one app.
-- - seen_at: its last sync. Workers sync their release at least every 20 s;
--   a release not synced for a while has no worker left, and then no
--   longer outranks older ones (a rollback takes over).
--
-- A schedule row names the release that stored it; rows stored before this
-- migration name none, and any release may overwrite them.

create table {schema}.schedule_releases (
    generation  bigint generated always as identity primary key,
    release     text not null unique,
    tasks       text[] not null,
    seen_at     timestamptz not null
);

alter table {schema}.schedules add column release text;
