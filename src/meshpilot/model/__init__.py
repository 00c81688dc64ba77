"""The service mesh model: plain, picklable data shared by every stage."""
