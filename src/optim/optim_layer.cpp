// placeholder until the optim layer lands
namespace moetrain {}
