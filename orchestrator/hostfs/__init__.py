"""Host I/O on folders a worker can write: nothing here ever follows a link it planted.

Zones, session folders, outboxes and the folders above them are host folders a hostile
worker may change while the host works in them. Every open of such a path goes through
this package, by concern:

- :mod:`.flags`: the one set of open flags (``O_NOFOLLOW``, never blocking on a FIFO);
- :mod:`.paths`: a path opened from ``/`` one component at a time, or beneath a folder
  descriptor, refusing the first link;
- :mod:`.entries`: one entry of an opened folder (open it as it was looked at, its
  permission bits, its kind and the words for it);
- :mod:`.walk`: a whole tree walked as root, one folder descriptor at a time;
- :mod:`.expand`: paths and glob patterns a person names, expanded to regular files
  without following any link (a batch's inputs);
- :mod:`.hostpath`: a path a person names, whose links are followed except inside the
  folders a worker can write;
- :mod:`.files`: the orchestrator's own files next to them (durable writes, locks);
- :mod:`.owners`: whether another local user could change a file it is about to trust.

A leaf: it imports nothing else from the orchestrator.
"""
