"""State that outlives one request, behind small interfaces the relays are given.

sessions.py: sealed legacy session ids and the session store (memory); task_records.py: records of
the tasks the proxy hosts (memory); redis_store.py and redis_tasks.py: both stores on Redis, for
replicas, over redis_connection.py (the client, deadlines, the breaker); sealing.py: authenticated
encryption of every token the proxy hands out; cache.py: the response cache of list and read
results. Imports only the protocol core and the cross-cutting root modules.
"""
