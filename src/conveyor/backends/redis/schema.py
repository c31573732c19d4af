"""The Redis store's layout: its version, and how ``open`` marks, converts
or checks it.

Redis has no numbered migrations: the layout key (``{p}:layout``, see
:mod:`.keys`) holds the version of the key layout a store was written
with, and stands for them. :meth:`Layout.migrate` marks a new store or
converts one of a layout this one upgrades (``lua/open.lua``);
:meth:`Layout.require_migrated` refuses one that is missing or older. Each
check is one GET; only a store to mark or convert is written.

A mixin of :class:`~conveyor.backends.redis.backend.RedisBackend`.
"""

from __future__ import annotations

from conveyor.backends.redis import keys
from conveyor.backends.redis.store import RedisStore, translated
from conveyor.errors import ConfigurationError, StoreNotReadyError
from conveyor.records import Migration


class Layout(RedisStore):
    """The key layout's version, marked, converted and checked."""

    async def _layout(self) -> str | None:
        with translated():
            found = await self._redis.get(keys.layout(self.prefix))
        return None if found is None else str(found)  # decode_responses: a str

    def _other_layout(self, found: str) -> ConfigurationError:
        return ConfigurationError(
            f"the Redis store {self.location} has key layout {found!r}; "
            f"this conveyor reads layout {keys.LAYOUT_VERSION!r}"
        )

    async def migrate(self) -> list[int]:
        """Mark a new store with this layout's version, or convert one of a
        layout this one upgrades (:data:`keys.UPGRADED`, ``lua/open.lua``);
        a store of this layout is only read (one GET). Raises
        ConfigurationError for a store written with another layout. Returns
        the layout version when it wrote it (Redis has no numbered
        migrations: the layout stands for them), else nothing."""
        found = await self._layout()
        if found == keys.LAYOUT_VERSION:
            return []
        found = await self._run("open", [keys.LAYOUT_VERSION, *sorted(keys.UPGRADED)])
        if found != keys.LAYOUT_VERSION:
            raise self._other_layout(str(found))
        return [int(keys.LAYOUT_VERSION)]

    async def require_migrated(self) -> None:
        """Raise StoreNotReadyError unless the prefix holds a store of this
        layout (an older one that :meth:`migrate` converts too); one GET."""
        found = await self._layout()
        if found is None:
            raise StoreNotReadyError(
                f"no conveyor store at {self.location}: run `conveyor migrate`"
            )
        if found in keys.UPGRADED:
            raise StoreNotReadyError(
                f"the conveyor store at {self.location} has the older key layout {found!r}: "
                "run `conveyor migrate`"
            )
        if found != keys.LAYOUT_VERSION:
            raise self._other_layout(found)

    async def pending_migrations(self) -> list[Migration]:
        """A Redis store has no numbered migrations, only a key layout
        version: one pending "migration" when the prefix holds no store or
        one of an older layout (``conveyor migrate`` marks or converts it,
        see ``lua/open.lua``); none when it is current. One GET; writes
        nothing. Raises ConfigurationError for a store of another layout."""
        found = await self._layout()
        if found == keys.LAYOUT_VERSION:
            return []
        if found is not None and found not in keys.UPGRADED:
            raise self._other_layout(found)
        action = "marks this new store" if found is None else f"converts layout {found} to"
        script = (
            f"-- conveyor migrate {action} key layout {keys.LAYOUT_VERSION} "
            "(lua/open.lua): Redis has no SQL to review\n"
        )
        return [Migration(int(keys.LAYOUT_VERSION), f"layout_{keys.LAYOUT_VERSION}", script)]

    async def destroy(self) -> None:
        """Delete every key of this store (those of its prefix), found with
        SCAN: the only operation that walks the key space."""
        client = self._redis
        with translated():
            batch: list[str] = []
            async for key in client.scan_iter(match=keys.pattern(self.prefix), count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    await client.unlink(*batch)
                    batch = []
            if batch:
                await client.unlink(*batch)
