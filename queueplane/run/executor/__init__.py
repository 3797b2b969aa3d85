"""What every group type's tasks share in the executors' Python worker processes: what a process
keeps from one task to the next, loading and calling the handler, the crash journal that blames
a handler that killed its process, and the guards that end a process before it hangs or swells."""
